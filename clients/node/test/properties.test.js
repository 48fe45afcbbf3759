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

test('header vectors', () => {
  // CONTRACT.md's header test vectors, written out here as JavaScript
  // values (the Go and Python producers' tests have them in theirs): any
  // name but the reserved ones, __proto__ too (a computed key makes it an
  // own property), 64-bit integers as safe-integer numbers or bigints, and
  // a number only if it is a whole number within +-(2^53-1). null: refused,
  // with an error naming the header.
  for (const [name, value, want] of [
    ['__proto__', 'x', '{"headers":{"__proto__":"x"}}'],
    ['constructor', 'y', '{"headers":{"constructor":"y"}}'],
    ['s', '', '{"headers":{"s":""}}'],
    ['b', true, '{"headers":{"b":true}}'],
    ['n', 2, '{"headers":{"n":2}}'],
    ['n', -128, '{"headers":{"n":-128}}'],
    ['n', 4294967295, '{"headers":{"n":4294967295}}'],
    ['max', 2n ** 63n - 1n, '{"headers":{"max":9223372036854775807}}'],
    ['min', -(2n ** 63n), '{"headers":{"min":-9223372036854775808}}'],
    ['over', 2n ** 63n, null],
    ['f', 2.0, '{"headers":{"f":2}}'],
    ['f', -9007199254740991.0, '{"headers":{"f":-9007199254740991}}'],
    ['f', 9007199254740992.0, null],
    ['f', 2.5, null],
    ['f', NaN, null],
    ['f', Infinity, null],
    ['x-due-ms', 1, null],
    ['', 'a', null],
    ['l', ['a'], null],
    ['o', { a: 1 }, null],
    ['z', null, null],
  ]) {
    const props = { headers: { [name]: value } };
    const label = `${name} = ${String(value)}`;
    if (want === null) {
      assert.throws(() => dp.propertiesJson(props), (err) => name === '' || err.message.includes(`"${name}"`), label);
    } else {
      assert.equal(dp.propertiesJson(props), want, label);
    }
  }
  // As JSON.parse gives it, and as validateProperties returns it: an own
  // property, not the object's prototype.
  const parsed = dp.validateProperties(JSON.parse('{"headers":{"__proto__":"x"}}'));
  assert.deepEqual(Object.keys(parsed.headers), ['__proto__']);
  assert.equal(Object.getPrototypeOf(parsed.headers), Object.prototype);
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
