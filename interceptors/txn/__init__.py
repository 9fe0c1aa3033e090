"""txn: transaction sessions — validate every transactional message before anything is written.

A transaction is framed in the log by BeginTxn, bodies (ordinary messages carrying a ``TxnContext``)
and CommitTxn or RollbackTxn.  Readers hold it apart and deliver it whole at the commit's timestamp,
or never.  This step makes the writer side keep the promises readers rely on:

* **Ids.**  ``TxnManager.begin`` allocates the id (increasing per pchannel; after reopen it resumes at
  one above the largest id found in replay) and the caller builds the BeginTxn with the returned
  context (``TxnManager.begin_message`` does both).  A BeginTxn whose id was not allocated here, or
  was already begun, is refused.  The service should hand the id to a client only after the BeginTxn
  is durable: an id allocated but never written is not seen by replay and may be allocated again
  after a restart.
* **Clock.**  Time is the messages' own timestamps (the timetick step stamped them before this step),
  never wall time, so expiry is deterministic and replayable.  The rule is ``wal.clock.txn_expired``
  (idle more than ``keepalive_ms`` physical milliseconds after ``last_ts``, the largest timestamp of
  the BeginTxn and written bodies); the scanner calls the same function at its TimeTick barriers (and
  takes the largest timestamp too, not the last one read: bodies may land out of order).  Because a
  barrier at ``T`` is written only after every allocation below ``T`` finished, a message accepted
  here (not expired at its own timestamp) is never behind a barrier that expired its transaction.
* **Commit after every body.**  A commit must carry a timestamp larger than every body accepted
  for its transaction (including bodies still being written) — otherwise readers would deliver, at
  the commit's timestamp, a body stamped after it.  Once a commit is accepted the session is
  ON_COMMIT and refuses further bodies, so nothing can slip in with a larger timestamp; the commit
  then waits until the bodies in flight are written, so every body precedes the commit in the log.
  A commit that fails to be written (or whose wait ends with a body that failed) puts the session
  back IN_FLIGHT: the client learns the outcome and may retry.  The timestamp rule keeps a retry
  with the same timestamp (the redo step) safe.
* **All or nothing.**  A batch is validated as a whole, in order — it may begin, fill and commit a
  transaction, and mix several transactions with plain messages — and on the first invalid message
  the step raises and passes nothing down.  ``TxnManager.claim`` returns a ``TxnClaim``: the batch's
  claims (bodies in flight, commit or rollback in progress), taken synchronously after validation;
  the step then ``wait()``s, writes, and ``settle(results)``s it, or ``abort()``s it if the write
  fails, so redo may run the same batch again.
* **Closing.**  RollbackTxn is accepted for a session that is IN_FLIGHT, and also, once, for one
  that will never commit (expired, or failed by an exclusive message): writing the record lets
  readers forget it at once, which matters when it has no keepalive.  Bodies and commits of such a
  session fail with TxnExpiredError or InvalidTxnStateError.
* **Recovery.**  Replay rebuilds the sessions from the log.  A transaction still open after replay
  can never be completed (its client lost its session with the old term), so it is expired and
  reported by ``take_orphans``; the owner writes ``rollback_message(session)`` for each.  It is
  never delivered, never half delivered.

Modules: ``session.py`` (TxnState, TxnSession, the session table, commit/rollback messages),
``manager.py`` (TxnManager), ``claim.py`` (the batch protocol: TxnClaim) and ``interceptor.py``
(TxnInterceptor, the chain step).
"""

from interceptors.txn.claim import TxnClaim
from interceptors.txn.interceptor import TxnInterceptor
from interceptors.txn.manager import TxnManager
from interceptors.txn.session import TxnSession, TxnState, commit_message, rollback_message

__all__ = [
    "TxnClaim",
    "TxnInterceptor",
    "TxnManager",
    "TxnSession",
    "TxnState",
    "commit_message",
    "rollback_message",
]
