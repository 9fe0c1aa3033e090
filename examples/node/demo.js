#!/usr/bin/env node
// A Node.js client of the streamingnode v1 contract, built from proto/ alone (no generated code, no
// SDK): create a pchannel, produce, run a transaction, consume it all back, read the ErrorInfo of a
// refused call and the ErrorDetail of a refused batch, and open an idempotent producer twice (epochs,
// the next sequence, PRODUCER_FENCED and DUPLICATE_SEQUENCE_MISMATCH).
//
//   npm ci && node demo.js 127.0.0.1:7070 [pchannel]
//
// It can run again on the same pchannel: the pchannel is created if it does not exist, the read starts
// at what this run produced, and the producer's steps use the epoch and sequence the node hands out.
//
// Each step prints one JSON line, so a test (tests/integration/test_node_example.py) can check it.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const PROTO = path.resolve(__dirname, '..', '..', 'proto');
const DEADLINE_MS = 10000;

// longs: String — timeticks are hybrid timestamps (physical_ms << 18 | logical), about 2^58 today:
// above Number.MAX_SAFE_INTEGER (2^53 - 1), so a JavaScript number would silently round them.  Keep
// them as decimal strings (or BigInt) and send them back as such.
const LOAD_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [PROTO] };
const service = grpc.loadPackageDefinition(
  protoLoader.loadSync('streamingnode/v1/streaming.proto', LOAD_OPTIONS)).streamingnode.v1.StreamingNode;

// The rich error model: the trailer grpc-status-details-bin holds a google.rpc.Status whose details
// hold a google.rpc.ErrorInfo (reason = the ErrorCode name, domain "streamingnode").
const rpcTypes = new protobuf.Root();
rpcTypes.resolvePath = (_origin, target) => path.join(PROTO, target);
rpcTypes.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
const Status = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfo = rpcTypes.lookupType('google.rpc.ErrorInfo');

function say(step, fields) {
  console.log(JSON.stringify({ step, ...fields }));
}

function deadline() {
  return { deadline: Date.now() + DEADLINE_MS };
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, deadline(), (err, response) => (err ? reject(err) : resolve(response)));
  });
}

function errorInfo(err) {
  const raw = err.metadata && err.metadata.get('grpc-status-details-bin')[0];
  if (!raw) return null;
  const status = Status.decode(raw);
  for (const any of status.details) {
    if (any.type_url === 'type.googleapis.com/google.rpc.ErrorInfo') {
      const info = ErrorInfo.decode(any.value);
      return { status_code: status.code, message: status.message, reason: info.reason, domain: info.domain, metadata: info.metadata };
    }
  }
  return null;
}

// A bidirectional stream read one response at a time: next() resolves with the next response, or
// rejects with the call's error.
function responses(call) {
  const queue = [];
  const waiting = [];
  let failure = null;
  let ended = false;
  const settle = () => {
    while (waiting.length && (queue.length || failure || ended)) {
      const { resolve, reject } = waiting.shift();
      if (queue.length) resolve(queue.shift());
      else if (failure) reject(failure);
      else resolve(null);
    }
  };
  call.on('data', (r) => { queue.push(r); settle(); });
  call.on('error', (e) => { failure = e; settle(); });
  call.on('end', () => { ended = true; settle(); });
  return () => new Promise((resolve, reject) => { waiting.push({ resolve, reject }); settle(); });
}

async function produce(client, pchannel, batches) {
  const call = client.Produce(deadline());
  const next = responses(call);
  call.write({ open: { pchannel } });
  const opened = await next();
  if (opened.response !== 'opened') throw new Error(`expected opened, got ${opened.response}`);
  batches.forEach((batch, i) => call.write({ batch: { request_id: String(i + 1), ...batch } }));
  call.write({ close: {} });
  const results = [];
  for (let r = await next(); r !== null; r = await next()) {
    if (r.response === 'result') results.push(r.result);
  }
  return results;
}

// An idempotent producer's stream: the open names the producer_id (and, when this instance
// reconnects, the producer_epoch an earlier open returned); the node answers with the producer's
// epoch and the next sequence it expects.
async function openProducer(client, pchannel, producerId, producerEpoch) {
  const call = client.Produce(deadline());
  const next = responses(call);
  const open = { pchannel, producer_id: producerId };
  if (producerEpoch !== undefined) open.producer_epoch = producerEpoch;
  call.write({ open });
  const first = await next();
  if (first.response !== 'opened') throw new Error(`expected opened, got ${first.response}`);
  return { call, next, opened: first.opened };
}

function data(vchannel, text) {
  return { type: 'MESSAGE_TYPE_DATA', vchannel, payload: Buffer.from(text) };
}

// Reads from message id `from` on (a MessageID as an append result gave it), until `wanted` messages.
async function consume(client, pchannel, vchannel, from, wanted) {
  const call = client.Consume(deadline());
  const next = responses(call);
  call.write({ open: { pchannel, vchannel, policy: { start_from: from } } });
  const seen = [];
  for (let r = await next(); r !== null; r = await next()) {
    if (r.response === 'pack') {
      for (const m of r.pack.messages) {
        if (m.type === 'MESSAGE_TYPE_TIME_TICK') continue;
        seen.push({ type: m.type, payload: m.payload.toString(), timetick: m.timetick, txn_id: m.txn ? m.txn.txn_id : '0' });
      }
      if (seen.length >= wanted) call.write({ close: {} });
    } else if (r.response === 'closed') {
      call.end();
    }
  }
  return seen;
}

async function main() {
  const address = process.argv[2];
  const pchannel = process.argv[3] || 'node-demo';
  if (!address) throw new Error('usage: node demo.js <host:port> [pchannel]');
  const client = new service(address, grpc.credentials.createInsecure());
  try {
    // "If not exists": a second run finds the pchannel there (ALREADY_EXISTS, ErrorInfo reason
    // CHANNEL_EXIST) and goes on with it; every later step reads only what this run wrote.
    let existed = false;
    try {
      await unary(client, 'CreateChannels', { channel_names: [pchannel] });
    } catch (err) {
      const info = errorInfo(err);
      if (!info || info.reason !== 'CHANNEL_EXIST') throw err;
      existed = true;
    }
    say('created', { pchannel, existed });

    const produced = await produce(client, pchannel, [{ messages: [data('v', 'one'), data('v', 'two')] }]);
    const results = produced[0].appended.results;
    say('produced', { request_id: produced[0].request_id, timeticks: results.map((r) => r.timetick) });

    const begun = await unary(client, 'BeginTxn', { pchannel, vchannel: 'v', keepalive_ms: '60000' });
    const txn = { txn_id: begun.txn_id, keepalive_ms: begun.keepalive_ms };
    const body = await produce(client, pchannel, [{ txn, messages: [data('v', 'in the transaction')] }]);
    const committed = await unary(client, 'CommitTxn', { pchannel, vchannel: 'v', txn_id: begun.txn_id });
    say('transaction', { txn_id: begun.txn_id, body: body[0].outcome, commit_timetick: committed.commit_timetick });

    // BEGIN and COMMIT framing messages are delivered too, around the body.
    const messages = await consume(client, pchannel, 'v', results[0].id, 5);
    const beyond = messages.every((m) => BigInt(m.timetick) > BigInt(Number.MAX_SAFE_INTEGER));
    say('consumed', { messages, timeticks_beyond_2_53: beyond });

    try {
      await unary(client, 'BeginTxn', { pchannel: 'no-such-pchannel', vchannel: 'v' });
      say('refused', { error: 'the call succeeded' });
    } catch (err) {
      say('refused', { grpc_code: grpc.status[err.code], error_info: errorInfo(err) });
    }

    const refused = await produce(client, pchannel, [{ messages: [{ type: 'MESSAGE_TYPE_INSERT', vchannel: 'v' }] }]);
    say('refused_batch', { outcome: refused[0].outcome, code: refused[0].error.code, message: refused[0].error.message });

    // Idempotent producers: the node owns the producer's identity.  A new instance gets the next
    // epoch and continues from the node's next sequence; the older instance is fenced.
    const first = await openProducer(client, pchannel, 'node-demo-producer');
    first.call.write({ batch: { request_id: '1', first_sequence: first.opened.next_sequence,
                                messages: [data('idem', 'once')] } });
    const written = (await first.next()).result;
    const second = await openProducer(client, pchannel, 'node-demo-producer');
    say('idempotent', { epoch: first.opened.producer_epoch, next_sequence: first.opened.next_sequence,
                        outcome: written.outcome, reopened_epoch: second.opened.producer_epoch,
                        reopened_next_sequence: second.opened.next_sequence });
    // The first instance's next batch: PRODUCER_FENCED ends its stream (ErrorInfo names both epochs).
    first.call.write({ batch: { request_id: '2', first_sequence: second.opened.next_sequence,
                                messages: [data('idem', 'from the zombie')] } });
    try {
      await first.next();
      say('fenced', { error: 'the batch was answered' });
    } catch (err) {
      say('fenced', { grpc_code: grpc.status[err.code], error_info: errorInfo(err) });
    }
    // The sequence of 'once' again (0 on a first run) with other content: refused in band, nothing written.
    second.call.write({ batch: { request_id: '1', first_sequence: first.opened.next_sequence,
                                 messages: [data('idem', 'changed')] } });
    const mismatch = (await second.next()).result;
    say('mismatch', { outcome: mismatch.outcome, code: mismatch.error.code, metadata: mismatch.error.metadata });
    second.call.write({ close: {} });
    while ((await second.next()) !== null);
  } finally {
    client.close();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err && err.stack ? err.stack : String(err));
    process.exit(1);
  },
);
