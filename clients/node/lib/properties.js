'use strict';
// Task ids and message properties (the contract's task-id extension).
//
// A task scheduled with an id keeps its body in the hash P:{Q:i}:tasks and
// its properties, a JSON object, in P:{Q:i}:props, both under the id. The
// dispatcher validates the properties again when it publishes, and
// dead-letters a task whose properties break a rule; checking them here
// turns that into an error at the call instead.

const MAX_ID_BYTES = 1024;
const MAX_PROPERTIES_BYTES = 32 << 10; // the stored JSON; AMQP's header frame must hold it
const MAX_SHORT_STRING = 255; // AMQP: routing key, basic properties, header names
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

const STRING_FIELDS = ['routing_key', 'content_type', 'content_encoding', 'correlation_id', 'reply_to', 'type'];
const INT_FIELDS = ['priority', 'expiration_ms', 'deadline_ms'];
const FIELDS = new Set([...STRING_FIELDS, ...INT_FIELDS, 'headers']);

/** A task id as the bytes stored (a string as UTF-8): 1 to 1024 bytes. */
function taskIdBytes(id) {
  let b;
  if (Buffer.isBuffer(id)) b = id;
  else if (id instanceof Uint8Array) b = Buffer.from(id.buffer, id.byteOffset, id.byteLength);
  else if (typeof id === 'string') b = Buffer.from(id, 'utf8');
  else throw new TypeError(`task id ${String(id)}: want a Buffer, Uint8Array or string`);
  if (b.length < 1 || b.length > MAX_ID_BYTES) {
    throw new RangeError(`task id of ${b.length} bytes: must be 1 to ${MAX_ID_BYTES} bytes`);
  }
  return b;
}

/** Whether a header name is the dispatcher's own: x-dispatcher-*, x-task-id, x-due-ms. */
function reservedHeader(name) {
  const low = name.toLowerCase();
  return low.startsWith('x-dispatcher-') || low === 'x-task-id' || low === 'x-due-ms';
}

/** An integer of 64 bits: a safe-integer number or a bigint in range. */
function isInt64(v) {
  if (typeof v === 'bigint') return v >= INT64_MIN && v <= INT64_MAX;
  return Number.isSafeInteger(v);
}

function show(v) {
  if (typeof v === 'bigint') return `${v}n`;
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

function kind(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return 'non-integer number';
  return typeof v;
}

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !Buffer.isBuffer(v);
}

function validateHeaders(headers) {
  if (!isPlainObject(headers) || headers instanceof Map) {
    throw new TypeError(`properties: field "headers": ${show(headers)} is not an object`);
  }
  const out = {};
  for (const name of Object.keys(headers).sort()) { // the same error for the same input
    const value = headers[name];
    if (name === '') throw new RangeError('properties: headers: empty header name');
    if (reservedHeader(name)) throw new RangeError(`properties: headers: "${name}" is reserved for the dispatcher`);
    if (Buffer.byteLength(name, 'utf8') > MAX_SHORT_STRING) {
      throw new RangeError(`properties: headers: a name of ${Buffer.byteLength(name, 'utf8')} bytes, over AMQP's ${MAX_SHORT_STRING}`);
    }
    if (!(typeof value === 'string' || typeof value === 'boolean' || isInt64(value))) {
      throw new TypeError(`properties: headers: "${name}": ${show(value)} is a ${kind(value)} ` +
        '(strings, 64-bit integers and booleans only)');
    }
    // Any name is a header, __proto__ too: assigned, it would set the
    // object's prototype and vanish from the headers.
    Object.defineProperty(out, name, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/**
 * Checks properties by the dispatcher's rules and returns them as the
 * object to store, without the fields that are undefined or null (absent).
 * Throws (TypeError or RangeError) naming the field: an unknown field, a
 * non-string where a string goes, priority outside 0..255, a negative
 * expiration_ms, a header named x-dispatcher-*, x-task-id or x-due-ms, or a
 * header value that is not a string, an integer (a safe-integer number or
 * a 64-bit bigint) or a boolean.
 */
function validateProperties(props) {
  if (props === undefined || props === null) return {};
  if (!isPlainObject(props) || props instanceof Map) {
    throw new TypeError(`properties ${show(props)}: want a plain object`);
  }
  const out = {};
  for (const name of Object.keys(props).sort()) {
    let value = props[name];
    if (!FIELDS.has(name)) {
      throw new RangeError(`properties: unknown field "${name}" (known: ${[...FIELDS].sort().join(', ')})`);
    }
    if (value === undefined || value === null) continue;
    if (STRING_FIELDS.includes(name)) {
      if (typeof value !== 'string') throw new TypeError(`properties: field "${name}": ${show(value)} is not a string`);
      const n = Buffer.byteLength(value, 'utf8');
      if (n > MAX_SHORT_STRING) throw new RangeError(`properties: ${name} is ${n} bytes, over AMQP's ${MAX_SHORT_STRING}`);
    } else if (INT_FIELDS.includes(name)) {
      if (!isInt64(value)) throw new TypeError(`properties: field "${name}": ${show(value)} is not a 64-bit integer`);
      if (name === 'priority' && !(value >= 0 && value <= 255)) {
        throw new RangeError(`properties: priority ${value} is not 0 to 255`);
      }
      if (name === 'expiration_ms' && value < 0) throw new RangeError(`properties: expiration_ms ${value} is negative`);
    } else {
      value = validateHeaders(value);
    }
    out[name] = value;
  }
  return out;
}

/** JSON of a checked value; bigints as JSON integers. */
function toJSON(v) {
  if (typeof v === 'bigint') return v.toString();
  if (isPlainObject(v)) return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}:${toJSON(x)}`).join(',')}}`;
  return JSON.stringify(v);
}

/**
 * The properties as the JSON object stored in P:{Q:i}:props, after
 * validateProperties; null when they set nothing (no entry is written).
 */
function propertiesJson(props) {
  const checked = validateProperties(props);
  const setsSomething = Object.values(checked).some((v) => v !== '' && !(isPlainObject(v) && Object.keys(v).length === 0));
  if (!setsSomething) return null;
  const out = toJSON(checked);
  const n = Buffer.byteLength(out, 'utf8');
  if (n > MAX_PROPERTIES_BYTES) throw new RangeError(`properties are ${n} bytes, over ${MAX_PROPERTIES_BYTES}`);
  return out;
}

module.exports = { MAX_ID_BYTES, propertiesJson, reservedHeader, taskIdBytes, validateProperties };
