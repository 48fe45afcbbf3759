import type { Redis } from 'ioredis';

export type Member = Buffer | Uint8Array | string;
/** A Date, or integer milliseconds since the Unix epoch. */
export type Due = Date | number;
export type Task = [Member, Due] | { member: Member; due: Due };

/** A header value: a string, a boolean, or an integer (a safe-integer number, 2.0 being 2, or a 64-bit bigint). */
export type HeaderValue = string | boolean | number | bigint;

/** Message properties of a task (CONTRACT.md); every field is optional, null or undefined is absent. */
export interface Properties {
  /** Replaces the queue's routing key for this task (the exchange stays the queue's). */
  routing_key?: string | null;
  /** AMQP headers; x-dispatcher-*, x-task-id and x-due-ms are reserved. Trace context as traceparent/tracestate. */
  headers?: Record<string, HeaderValue> | null;
  content_type?: string | null;
  content_encoding?: string | null;
  correlation_id?: string | null;
  reply_to?: string | null;
  type?: string | null;
  /** 0 to 255. */
  priority?: number | bigint | null;
  /** The per-message TTL the broker applies, ms, >= 0. */
  expiration_ms?: number | bigint | null;
  /** ms since the epoch: not publishable by then, the task is dead-lettered ("deadline passed"). */
  deadline_ms?: number | bigint | null;
}

export interface Layout {
  /** The shard count M producers hash with (P:{Q}:shards). */
  readonly shards: number;
  /** During a change of the shard count, the old M; 0 otherwise. */
  readonly changingFrom: number;
  /** After a shrink, the M it shrank from; 0 otherwise. */
  readonly retired: number;
}

export interface ProducerOptions {
  /** DISPATCHER_KEY_PREFIX; default "dq". */
  prefix?: string;
  /** Used only while no shard count is recorded in Redis, with a warning. */
  shards?: number;
  /** Tasks due within this many ms also wake the dispatchers; default 1000, 0 turns it off. */
  wakeWithinMs?: number;
  /** Where warnings go; default process.emitWarning. */
  warn?: (message: string) => void;
  /** Monotonic clock in ms; default performance.now. */
  clock?: () => number;
}

export class Producer {
  constructor(redis: Redis, queue: string, options?: ProducerOptions);
  readonly queue: string;
  readonly prefix: string;
  readonly keys: Keys;
  layout(): Promise<Layout>;
  schedule(member: Member, due: Due): Promise<number>;
  scheduleMany(tasks: Iterable<Task>): Promise<number[]>;
  reschedule(member: Member, due: Due): Promise<boolean>;
  cancel(member: Member): Promise<boolean>;
  /** Schedules a task by its id (1 to 1024 bytes) with its body and properties; resolves to the shard index. */
  scheduleTask(id: Member, body: Member, due: Due, properties?: Properties | null): Promise<number>;
  /** Moves a pending task to a new due time; false if it is not pending. */
  rescheduleTask(id: Member, due: Due): Promise<boolean>;
  /** Cancels a pending task, its body and properties; false if it was not pending. */
  cancelTask(id: Member): Promise<boolean>;
}

export class Keys {
  constructor(prefix: string, queue: string);
  readonly prefix: string;
  readonly queue: string;
  pending(i: number): string;
  moving(i: number): string;
  tasks(i: number): string;
  props(i: number): string;
  shardCount(): string;
  reshard(): string;
  retired(): string;
  wake(): string;
}

export class ProducerError extends Error {}
export class NoLayoutError extends ProducerError {}
export class LayoutError extends ProducerError {}

export interface Hashing {
  xxh64(member: Member): bigint;
  shardOf(member: Member, shards: number): number;
  messageId(member: Member, dueMs: number): string;
}

export function loadHashing(): Promise<Hashing>;
export function xxh64(member: Member): Promise<bigint>;
export function shardOf(member: Member, shards: number): Promise<number>;
export function messageId(member: Member, dueMs: number): Promise<string>;
export function checkVectors(): Promise<void>;
export function dueMs(due: Due): number;
export function validateProperties(properties: Properties | null | undefined): Properties;
export function propertiesJson(properties: Properties | null | undefined): string | null;
export function reservedHeader(name: string): boolean;
export function taskIdBytes(id: Member): Buffer;
export function readLayout(redis: Redis, keys: Keys): Promise<Layout>;

export const VECTORS: ReadonlyArray<readonly [string, string, number]>;
export const DEFAULT_PREFIX: string;
export const MAX_SHARDS: number;
export const MAX_ID_BYTES: number;
export const DEFAULT_WAKE_WITHIN_MS: number;
export const LAYOUT_TTL_MS: number;
export const LAYOUT_RECHECK_MS: number;
