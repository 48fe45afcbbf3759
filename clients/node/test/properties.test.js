'use strict';
// Task ids and the client-side checks of message properties, without
// Redis: against the table the dispatcher's own parsing is checked against
// too (tests/testdata/clients/properties.json), and JavaScript's own values.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const dp = require('..');

const TABLE = path.join(__dirname, '..', '..', '..', 'tests', 'testdata', 'clients', 'properties.json');
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

test('the dispatcher\'s table of properties', () => {
  const { cases } = JSON.parse(fs.readFileSync(TABLE, 'utf8'));
  assert.ok(cases.length > 10);
  for (const c of cases) {
    const name = JSON.stringify(c.props);
    if (c.ok) {
      assert.doesNotThrow(() => dp.validateProperties(c.props), name);
    } else {
      assert.throws(() => dp.validateProperties(c.props), (err) => err.message.includes(c.field), name);
    }
  }
});

test('JavaScript values', () => {
  const limits = { headers: { min: -(2n ** 63n), max: 2n ** 63n - 1n, safe: Number.MAX_SAFE_INTEGER } };
  assert.deepEqual(dp.validateProperties(limits), limits);
  assert.equal(dp.propertiesJson(limits),
    '{"headers":{"max":9223372036854775807,"min":-9223372036854775808,"safe":9007199254740991}}');
  for (const [bad, field] of [
    [{ headers: { n: 2n ** 63n } }, '"n"'], [{ headers: { f: 0.5 } }, '"f"'],
    [{ headers: { u: Number.MAX_SAFE_INTEGER + 1 } }, '"u"'], [{ headers: { b: Buffer.from('x') } }, '"b"'],
    [{ headers: { d: new Date() } }, '"d"'], [{ headers: { u: undefined } }, '"u"'],
    [{ priority: true }, 'priority'], [{ priority: 5.5 }, 'priority'], [{ priority: 256n }, 'priority'],
    [{ headers: new Map([['a', 'b']]) }, 'headers'],
  ]) {
    assert.throws(() => dp.validateProperties(bad), (err) => err.message.includes(field), field);
  }
  assert.throws(() => dp.validateProperties([['routing_key', 'x']]), TypeError);
  assert.throws(() => dp.validateProperties('routing_key'), TypeError);
});

test('properties as JSON', () => {
  assert.equal(dp.propertiesJson(undefined), null);
  assert.equal(dp.propertiesJson({ routing_key: '', headers: {}, type: undefined, priority: null }), null,
    'properties that set nothing are no entry');
  const props = { routing_key: 'eu', priority: 0, headers: { traceparent: TRACEPARENT, n: 3, ok: false } };
  assert.deepEqual(JSON.parse(dp.propertiesJson(props)), props);
  assert.deepEqual(JSON.parse(dp.propertiesJson({ type: 'задача' })), { type: 'задача' });
});

test('task ids', () => {
  assert.deepEqual(dp.taskIdBytes('задача'), Buffer.from('задача'));
  assert.equal(dp.taskIdBytes(new Uint8Array(1024)).length, 1024);
  for (const bad of ['', Buffer.alloc(1025)]) assert.throws(() => dp.taskIdBytes(bad), /task id of \d+ bytes/);
  assert.throws(() => dp.taskIdBytes(42), TypeError);
});
