"""Node configuration: defaults that just work, then a TOML file, then environment, then flags.

Every field has a default, so ``streamingnode serve`` runs with no configuration at all (data under
``./data``, gRPC on port 19530).  A TOML file (``--config``) uses the field names as keys; an
environment variable ``STREAMINGNODE_<FIELD>`` (upper case) overrides the file; a command-line flag
overrides both.  Unknown keys and values of the wrong type are refused with the key's name, because
a silently ignored typo in a durability setting is worse than a node that does not start.

The fields of ``NodeConfig`` are the one list of settings: ``settings()`` reads them (with the
docstring under each as its help text), and ``streamingnode serve`` makes one flag per setting from
it, so a setting cannot exist in the file and the environment but be missing from the command line.

Only modules made of the standard library are imported at module level (the shared defaults and
address rule, the clock, the error and keepalive rules): ``streamingnode --help`` builds the serve
flags from this module, and must not load the storage backend.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# All standard library only (wal and flusher load their other modules on first use).
from flusher.compaction_config import DEFAULT_COMPACTION, CompactionConfig
from streamingnode.wire.defaults import NODE_ADDR, NODE_PORT
from streamingnode.wire.host_port import split_host_port
from wal.clock import TICK_INTERVAL
from wal.errors import InvalidArgumentError
from wal.txn_keepalive import check_keepalive

if TYPE_CHECKING:
    from wal.backend import Durability

ENV_PREFIX = "STREAMINGNODE_"
DEFAULT_ADDR = NODE_ADDR


@dataclass(frozen=True, slots=True)
class NodeConfig:
    data_dir: Path = field(default_factory=lambda: Path("data"))
    """Where the RocksDB database lives (created if missing)."""
    listen: str = f"127.0.0.1:{NODE_PORT}"
    """gRPC listen address; port 0 picks a free port (the bound one is logged and reported).  Loopback
    by default: listening on another interface needs authentication or ``allow_unauthenticated``."""
    metrics_listen: str = "127.0.0.1:9091"
    """Address of the Prometheus ``/metrics`` endpoint; port 0 picks a free port, empty turns it off."""
    tls_cert: Path | None = None
    """Server certificate chain (PEM); with ``tls_key`` the node serves TLS only."""
    tls_key: Path | None = None
    """Private key (PEM) of ``tls_cert``."""
    tls_client_ca: Path | None = None
    """CA bundle (PEM) that client certificates must chain to: mutual TLS, a client without one is refused."""
    auth_tokens: Path | None = None
    """Tokens file (TOML): SHA-256 hashes of bearer tokens, each with a principal and its permissions."""
    allow_unauthenticated: bool = False
    """Let the node listen on a non-loopback address with neither tokens nor mutual TLS."""
    durability: str = "sync"
    """``sync``: acknowledged after fsync.  ``relaxed``: after write(2); see wal.backend.Durability."""
    max_message_bytes: int = (4 << 20) - (512 << 10)
    """Largest message a producer may send (payload + vchannel + properties, in bytes).  3.5 MiB: with
    every envelope byte of a ConsumeResponse (up to 65,535 properties' framing, positions, ids: under
    400 KiB) one such message still fits gRPC's default 4 MiB receive limit of any client.  Raising
    it needs consumers that raise theirs (ConsumeOpen.max_response_bytes)."""
    max_request_bytes: int = 64 << 20
    """Largest gRPC request (a produce batch); over it gRPC refuses the request with RESOURCE_EXHAUSTED."""
    max_unary_request_bytes: int = 1 << 20
    """Largest request of a unary call (every RPC but Produce and Consume): over it the call is refused
    with RESOURCE_EXHAUSTED as soon as it is read, before it is parsed.  Unary requests are small by
    nature (1,024 channel names of 128 bytes are 135 KiB); gRPC itself reads any request up to
    ``max_request_bytes``, one limit for the whole server."""
    produce_max_in_flight: int = 64
    """Batches a produce stream may have pending; the node stops reading the stream until one ends."""
    produce_max_in_flight_bytes: int = 2 << 20
    """Bytes of messages a produce stream may have pending (payloads and 64 a message, as commits count
    them): the node stops reading the stream while its pending batches hold this much (a batch is
    always read when none is pending).  Appends commit in the order they came, so this is also what a
    lone append of another stream waits behind, per busy stream: 2 MiB keeps two 1 MiB commits in the
    pipeline and about 20 ms of queue at 100 MB/s."""
    consume_max_pack_messages: int = 4096
    """Default upper bound on the messages of one delivered MsgPack."""
    consume_max_pack_bytes: int = 2 << 20
    """Upper bound on one ConsumeResponse's pack: a larger pack (a transaction, never split into packs)
    goes over consecutive responses (MsgPack.continued), each within this and the consumer's limit."""
    consume_cache_bytes: int = 32 << 20
    """Bytes of encoded ConsumeResponses kept for sharing: consumers of one vchannel at the same
    position with the same options get the same bytes, encoded once (0: every consumer encodes its own)."""
    consume_delivery_share: float = 0.25
    """While appends go on, the most CPU time that delivery to consumers may take, as a share of one
    core (counted per 10 ms: the event loop's time delivering, and gRPC's sending threads' in
    proportion to the bytes delivered): readers that want more fall behind during a burst and catch
    up after it, and appends are not kept waiting behind them.  1: no bound."""
    consume_quiet_pack_seconds: float = 0.5
    """How often a reader whose vchannel has nothing new hears that its position moved (a pack without
    messages): the ticks of a busy pchannel come with every commit, and a thousand readers of quiet
    vchannels would each be sent one per tick.  The packs in between are joined into the next one
    sent (its start is theirs).  0: a pack at every tick."""
    consume_buffer_bytes: int = 4 << 20
    """Most bytes the node holds encoded for one consumer and not yet taken by it: past this it reads
    nothing more for that consumer until it reads, so a consumer that stalls costs at most this."""
    tail_buffer_bytes: int = 16 << 20
    """Per pchannel: the newest messages kept in memory for tailing consumers (counted as encoded
    bytes; Python adds ~15% for 1 KiB messages).  A consumer further behind reads storage instead:
    this bounds memory, not delivery.  Up to a quarter of it more holds blocks decoded from storage,
    shared by the readers behind the tail.  0: every read goes to storage (and decodes for itself)."""
    rocksdb_write_buffer_bytes: int = 16 << 20
    """Per node: one RocksDB memtable; at most two exist (one taking writes, one being flushed).
    Each flush writes one table file of about this size.  At least 1 MiB."""
    rocksdb_block_cache_bytes: int = 8 << 20
    """Per node: RocksDB's cache of blocks read from table files, which also holds the tables' index
    and filter blocks.  0: no cache (every read of a table goes to the file)."""
    malloc_arena_max: int = 2
    """C allocator (glibc) arenas the node's threads share.  Each arena keeps what was freed in it for
    its own threads: fewer arenas hold less freed memory (``streamingnode.node.memory_trim``).  0: glibc's
    default (8 per core)."""
    txn_keepalive_ms: int = 60_000
    """Idle time after which a transaction expires, when BeginTxn asks for the node default."""
    txn_max_messages: int = 100_000
    """Most messages one transaction may hold; one more fails it (TXN_TOO_LARGE) and rolls it back."""
    txn_max_bytes: int = 64 << 20
    """Most bytes (as ``max_message_bytes`` counts them) one transaction may hold; over it, as above."""
    max_streams: int = 1024
    """Produce and Consume streams open at once on the node; one more is refused (RESOURCE_EXHAUSTED)."""
    max_streams_per_connection: int = 128
    """Produce and Consume streams open at once on one client connection; one more is refused."""
    tick_interval: float = TICK_INTERVAL
    """Seconds between TimeTicks: the delivery latency floor of a consumer."""
    drain_seconds: float = 10.0
    """How long SIGTERM waits for in-flight calls before closing the WALs."""
    channels: tuple[str, ...] = ()
    """pchannels created at start when missing (so a fresh node can take produce at once)."""
    flusher: bool = True
    """Run a flusher per pchannel, writing its collections as Parquet under ``parquet_dir``."""
    parquet_dir: Path | None = None
    """Root of the Parquet files, one directory per pchannel (default: ``<data_dir>/parquet``): a path
    or a ``file://`` URI (flag ``--parquet-root``).  With the shared log it must be a filesystem every
    node mounts at the same path; object stores are refused (``flusher.root``)."""
    flush_max_rows: int = 1_000_000
    """Write a collection's buffer as a Parquet file once it holds this many rows."""
    flush_max_bytes: int = 64 << 20
    """... or once it holds this many bytes."""
    flush_max_age_seconds: float = 50.0
    """Write a buffer once its first row is this old, even when nothing else comes: an idle insert
    reaches Parquet within about this long plus a tick (``bench/freshness.py``), under a minute.  The
    file is a small one in its segment (the segment seals later, by size or at 600 s)."""
    flush_memory_cap_bytes: int = 256 << 20
    """All buffers of one pchannel's flusher together; above it the largest is written first."""
    compaction_interval_seconds: float = 300.0
    """How often each flusher compacts its small Parquet files (flusher/README.md "Compaction"); 0: never
    in the background (``streamingnode compact`` still does, offline)."""
    compaction_target_bytes: int = DEFAULT_COMPACTION.target_bytes
    """Size of a compacted file; files under half of it are small."""
    compaction_min_files: int = DEFAULT_COMPACTION.min_files
    """A partition is compacted once it holds this many small files (or a file with many deleted rows)."""
    compaction_horizon_seconds: float = DEFAULT_COMPACTION.horizon_seconds
    """As-of reads of the last this many seconds stay exact; earlier ones fail (AsOfBeforeHorizonError)."""
    compaction_grace_seconds: float = DEFAULT_COMPACTION.grace_seconds
    """How long a compaction's input files stay for readers that listed them before the switch."""
    compaction_io_bytes_per_second: int = 64 << 20
    """Read plus write rate of the node's background compaction (64 MiB/s), so it never takes the
    disk from appends and flushes; 0: no limit.  ``streamingnode compact`` runs unlimited."""
    retention_seconds: float = 86400.0
    """Keep WAL messages at least this long; older ones are truncated once the flusher, every consumer
    group and the open transactions are past them.  0: no time floor; negative: never truncate."""
    retention_check_seconds: float = 60.0
    """How often each pchannel checks what it may truncate."""
    snapshot_every_messages: int = 10_000
    """Store a recovery snapshot once this many messages were written since the last one (0: no
    message trigger): a restart replays only what came after the newest snapshot."""
    snapshot_every_seconds: float = 60.0
    """... or once this long passed since the last one and something was written (0: no time trigger)."""
    storage_min_free_bytes: int = 256 << 20
    """Low-water mark of free disk space, on the data directory's and the Parquet root's volumes:
    below it appends are refused (STORAGE_FULL, retriable) and the node flushes and truncates at
    once; taken again by themselves once space returns.  256 MiB covers what the node may write
    between two readings (every 0.5 s) plus a memtable flush and a Parquet file (see
    streamingnode.node.disk_guard).  0 turns the check off."""
    cluster_nats: str = ""
    """Cluster mode (off while empty): the NATS servers' URLs, comma-separated (flag ``--nats``, or
    ``--cluster-nats``).  The node then serves only the pchannels whose lease it holds
    (``streamingnode.cluster.ownership``); docs/cluster.md."""
    wal: str = "rocksdb"
    """The WAL backend: ``rocksdb`` (on ``data_dir``, this node's own) or ``jetstream`` (the log shared
    by the cluster, on the NATS servers of ``cluster_nats``; cluster mode only)."""
    nats_replicas: int = 3
    """``wal = "jetstream"``: replicas of each pchannel's stream and of the WAL's KV buckets (1 or 3)."""
    node_id: str = ""
    """This node's id in the cluster (unique, stable across restarts); required in cluster mode."""
    advertise: str = ""
    """host:port clients reach this node at (what NOT_OWNER and DescribeChannels name); default: the
    bound listen address."""
    lease_seconds: float = 10.0
    """Cluster mode: a pchannel lease's TTL; renewed every third of it."""
    cluster_prefix: str = "sn"
    """Cluster mode: the prefix of the NATS KV buckets (``<prefix>_nodes``, ``<prefix>_leases``)."""
    trace_exporter: str = "none"
    """OpenTelemetry spans: ``none`` (off, no cost), ``console`` (stdout) or ``otlp`` (needs the
    opentelemetry-exporter-otlp package; endpoint from the standard OTEL_EXPORTER_OTLP_* variables)."""
    log_level: str = "info"
    """Lowest level logged: ``debug``, ``info``, ``warning`` or ``error``."""
    log_format: str = "auto"
    """``json`` (one object a line, for collectors), ``console`` (readable) or ``auto``: console when
    both stdout and stderr are terminals, JSON otherwise.  Logs always go to stderr."""

    def __post_init__(self) -> None:
        if self.durability not in ("sync", "relaxed"):
            raise InvalidArgumentError(f"durability must be 'sync' or 'relaxed', got {self.durability!r}")
        if self.trace_exporter not in ("none", "console", "otlp"):
            raise InvalidArgumentError(
                f"trace_exporter must be 'none', 'console' or 'otlp', got {self.trace_exporter!r}")
        for name in ("listen", "metrics_listen", "advertise"):  # the last two may be empty: off, or the bound one
            address = getattr(self, name)
            if address or name == "listen":
                try:
                    split_host_port(address)
                except ValueError as exc:
                    raise InvalidArgumentError(f"{name}: {exc}", field=name) from None
        for name in ("max_message_bytes", "max_request_bytes", "produce_max_in_flight", "produce_max_in_flight_bytes",
                     "consume_max_pack_messages",
                     "consume_max_pack_bytes", "txn_max_messages", "txn_max_bytes", "max_streams",
                     "max_streams_per_connection"):
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_message_bytes > self.max_request_bytes:
            raise InvalidArgumentError("max_message_bytes must not exceed max_request_bytes")
        if not 0 < self.max_unary_request_bytes <= self.max_request_bytes:
            raise InvalidArgumentError(
                f"max_unary_request_bytes must be > 0 and <= max_request_bytes ({self.max_request_bytes}), got "
                f"{self.max_unary_request_bytes!r}", field="max_unary_request_bytes")
        if self.tick_interval <= 0 or self.drain_seconds < 0:
            raise InvalidArgumentError("tick_interval must be > 0, drain_seconds >= 0")
        check_keepalive(self.txn_keepalive_ms, "txn_keepalive_ms")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgumentError("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgumentError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if self.tail_buffer_bytes < 0 or self.rocksdb_block_cache_bytes < 0:
            name = "tail_buffer_bytes" if self.tail_buffer_bytes < 0 else "rocksdb_block_cache_bytes"
            raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)!r}", field=name)
        if not 0 < self.consume_delivery_share <= 1:
            raise InvalidArgumentError(
                f"consume_delivery_share must be > 0 and <= 1, got {self.consume_delivery_share!r}",
                field="consume_delivery_share")
        if not 0 <= self.consume_quiet_pack_seconds <= 3600:
            raise InvalidArgumentError(
                f"consume_quiet_pack_seconds must be >= 0 and <= 3600, got {self.consume_quiet_pack_seconds!r}",
                field="consume_quiet_pack_seconds")
        if self.malloc_arena_max < 0:
            raise InvalidArgumentError(f"malloc_arena_max must be >= 0, got {self.malloc_arena_max!r}",
                                       field="malloc_arena_max")
        if self.rocksdb_write_buffer_bytes < 1 << 20:
            raise InvalidArgumentError(
                f"rocksdb_write_buffer_bytes must be >= 1 MiB (1048576), got {self.rocksdb_write_buffer_bytes!r}",
                field="rocksdb_write_buffer_bytes")
        if self.storage_min_free_bytes < 0:
            raise InvalidArgumentError(f"storage_min_free_bytes must be >= 0, got {self.storage_min_free_bytes!r}")
        if (self.compaction_interval_seconds < 0 or self.compaction_target_bytes <= 0 or self.compaction_min_files < 1
                or self.compaction_horizon_seconds < 0 or self.compaction_grace_seconds < 0
                or self.compaction_io_bytes_per_second < 0):
            raise InvalidArgumentError("compaction settings: interval, horizon, grace and io limit must be >= 0, "
                                       "target_bytes > 0 and min_files >= 1")
        if self.wal not in ("rocksdb", "jetstream"):
            raise InvalidArgumentError(f"wal must be 'rocksdb' or 'jetstream', got {self.wal[:200]!r}", field="wal")
        if self.wal == "jetstream" and not self.cluster_nats:
            raise InvalidArgumentError("wal 'jetstream' needs cluster mode: give the NATS servers (--nats)",
                                       field="cluster_nats")
        if self.nats_replicas not in (1, 3):
            raise InvalidArgumentError(f"nats_replicas must be 1 or 3, got {self.nats_replicas!r}",
                                       field="nats_replicas")
        if self.cluster_nats:
            if not self.node_id:
                raise InvalidArgumentError("cluster mode (cluster_nats) needs node_id", field="node_id")
            if not self.lease_seconds > 0:
                raise InvalidArgumentError(f"lease_seconds must be > 0, got {self.lease_seconds!r}",
                                           field="lease_seconds")
            if not self.cluster_prefix or not self.cluster_prefix.replace("-", "").replace("_", "").isalnum():
                raise InvalidArgumentError(
                    f"cluster_prefix must be letters, digits, '-' or '_', got {self.cluster_prefix[:200]!r}",
                    field="cluster_prefix")
        if not self.retention_check_seconds > 0:
            raise InvalidArgumentError(f"retention_check_seconds must be > 0, got {self.retention_check_seconds!r}")
        if self.snapshot_every_messages < 0 or not self.snapshot_every_seconds >= 0:
            raise InvalidArgumentError(
                f"snapshot_every_messages and snapshot_every_seconds must be >= 0, got "
                f"{self.snapshot_every_messages!r} and {self.snapshot_every_seconds!r}")
        # The rest of the closed sets (the ones above say more about their own values).
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise InvalidArgumentError(
                    f"{name} must be one of {', '.join(map(str, allowed))}, got {str(getattr(self, name))[:200]!r}",
                    field=name)

    @property
    def parquet_root(self) -> Path:
        return self.parquet_dir if self.parquet_dir is not None else self.data_dir / "parquet"

    @property
    def shared_log(self) -> bool:
        """The WAL is the cluster's (JetStream), not this node's own."""
        return self.wal == "jetstream"

    @property
    def wal_durability(self) -> Durability:
        from wal.backend import Durability  # noqa: PLC0415  (see the module's docstring)

        return Durability(self.durability)


# The settings with a closed set of values: the flag offers them as choices, and the model refuses
# any other value from wherever it comes.
_CHOICES: dict[str, tuple[Any, ...]] = {
    "durability": ("sync", "relaxed"),
    "trace_exporter": ("none", "console", "otlp"),
    "wal": ("rocksdb", "jetstream"),
    "nats_replicas": (1, 3),
    "log_level": ("debug", "info", "warning", "error"),
    "log_format": ("auto", "json", "console"),
}

# Flags a setting answers to besides ``--<name with dashes>`` (names kept from earlier releases, or
# shorter ones that say the same).
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "cluster_nats": ("--nats",),
    "parquet_dir": ("--parquet-root",),
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One field of NodeConfig as every source of configuration sees it."""

    name: str
    """The TOML key and the field's name."""
    default: Any
    help: str
    """The first sentence(s) of the field's docstring, for ``--help``."""
    choices: tuple[Any, ...] | None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag, *FLAG_ALIASES.get(self.name, ()))

    @property
    def is_bool(self) -> bool:
        return isinstance(self.default, bool)


@functools.cache
def _field_docs() -> dict[str, str]:
    """Each NodeConfig field's docstring (the string right under it), read from this module's source:
    Python keeps no attribute docstrings at run time, and writing the help twice would let it drift."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NodeConfig")
    docs: dict[str, str] = {}
    for stmt, after in zip(cls.body, cls.body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def settings() -> list[Setting]:
    """Every setting of the node, in the order of NodeConfig's fields."""
    defaults = NodeConfig()
    docs = _field_docs()
    return [Setting(f.name, getattr(defaults, f.name), docs.get(f.name, ""), _CHOICES.get(f.name))
            for f in dataclasses.fields(NodeConfig)]


def compaction_config(cfg: NodeConfig) -> CompactionConfig:
    """The flushers' compaction settings from the node's (``compaction_*``)."""
    return CompactionConfig(target_bytes=cfg.compaction_target_bytes, min_files=cfg.compaction_min_files,
                            horizon_seconds=cfg.compaction_horizon_seconds, grace_seconds=cfg.compaction_grace_seconds,
                            io_bytes_per_second=cfg.compaction_io_bytes_per_second)


_FIELDS = {f.name: f for f in dataclasses.fields(NodeConfig)}
_DEFAULTS = NodeConfig()


def _convert(default: Any, value: Any) -> Any:
    """``value`` in the type of ``default``; TypeError or ValueError when it has no such form."""
    if isinstance(default, Path):
        return Path(value)
    if isinstance(default, bool):
        return value.strip().lower() in ("1", "true", "yes", "on") if isinstance(value, str) else bool(value)
    if isinstance(value, bool) and not isinstance(default, str):
        raise TypeError(value)  # True is an int to Python, never a size or a duration here
    if isinstance(default, int):
        if isinstance(value, float) and not value.is_integer():
            raise TypeError(value)
        return int(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, tuple):
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise TypeError(value)
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _coerce(name: str, value: Any, source: str) -> Any:
    """Turn a TOML, env or flag value into the field's type, or refuse it naming the key."""
    default = getattr(_DEFAULTS, name)
    if name == "parquet_dir" and isinstance(value, str):
        # A path or a URI: parsed (and object stores refused) where the flusher's roots are known.
        from flusher.root import parquet_root  # noqa: PLC0415  (pyarrow only for a URI)

        return parquet_root(value)
    if default is None:  # optional paths: None means "derived from another setting"
        default = Path()
    try:
        return _convert(default, value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{source}: {name} has a value of the wrong type: {value!r}") from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> NodeConfig:
    """Defaults < TOML file at ``path`` < ``env`` (os.environ when None) < ``overrides`` (flags).

    ``overrides`` values of None are ignored, so argparse results can be passed as they are.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read config file {os.fspath(path)!r}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgumentError(f"config file {os.fspath(path)!r} is not valid TOML: {exc}") from None
        for key, value in doc.items():
            if key not in _FIELDS:
                raise InvalidArgumentError(f"config file {os.fspath(path)!r}: unknown key {key!r}")
            values[key] = _coerce(key, value, f"config file {os.fspath(path)!r}")
    environ = os.environ if env is None else env
    for key in _FIELDS:
        raw = environ.get(ENV_PREFIX + key.upper())
        # An empty variable is a value for the settings whose empty value means something (an empty
        # metrics_listen turns metrics off, an empty cluster_nats cluster mode); for the others (numbers,
        # paths) it is as good as unset, as shells and compose files leave variables empty to mean "none".
        if raw is not None and (raw != "" or isinstance(getattr(_DEFAULTS, key), (str, tuple))):
            values[key] = _coerce(key, raw, f"environment {ENV_PREFIX + key.upper()}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in _FIELDS:
            raise InvalidArgumentError(f"unknown setting {key!r}")
        values[key] = _coerce(key, value, "command line")
    return NodeConfig(**values)


__all__ = ["DEFAULT_ADDR", "ENV_PREFIX", "FLAG_ALIASES", "NodeConfig", "Setting", "load_config", "settings"]
