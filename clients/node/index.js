'use strict';
// Producer for the dispatcher: schedules delayed tasks straight into Redis
// by the dispatcher's public contract (CONTRACT.md), so that the dispatcher
// publishes them to RabbitMQ at their due time.

const contract = require('./lib/contract');
const layout = require('./lib/layout');
const producer = require('./lib/producer');
const properties = require('./lib/properties');

module.exports = {
  Producer: producer.Producer,
  ProducerError: layout.ProducerError,
  NoLayoutError: layout.NoLayoutError,
  LayoutError: layout.LayoutError,
  readLayout: layout.readLayout,
  Keys: contract.Keys,
  VECTORS: contract.VECTORS,
  DEFAULT_PREFIX: contract.DEFAULT_PREFIX,
  MAX_SHARDS: contract.MAX_SHARDS,
  MAX_ID_BYTES: properties.MAX_ID_BYTES,
  DEFAULT_WAKE_WITHIN_MS: producer.DEFAULT_WAKE_WITHIN_MS,
  LAYOUT_TTL_MS: producer.LAYOUT_TTL_MS,
  LAYOUT_RECHECK_MS: producer.LAYOUT_RECHECK_MS,
  checkVectors: contract.checkVectors,
  dueMs: contract.dueMs,
  loadHashing: contract.loadHashing,
  messageId: contract.messageId,
  shardOf: contract.shardOf,
  xxh64: contract.xxh64,
  propertiesJson: properties.propertiesJson,
  reservedHeader: properties.reservedHeader,
  taskIdBytes: properties.taskIdBytes,
  validateProperties: properties.validateProperties,
};
