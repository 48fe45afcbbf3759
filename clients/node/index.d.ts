import type { Redis } from 'ioredis';

export type Member = Buffer | Uint8Array | string;
/** A Date, or integer milliseconds since the Unix epoch. */
export type Due = Date | number;
export type Task = [Member, Due] | { member: Member; due: Due };

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
}

export class Keys {
  constructor(prefix: string, queue: string);
  readonly prefix: string;
  readonly queue: string;
  pending(i: number): string;
  moving(i: number): string;
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
export function readLayout(redis: Redis, keys: Keys): Promise<Layout>;

export const VECTORS: ReadonlyArray<readonly [string, string, number]>;
export const DEFAULT_PREFIX: string;
export const MAX_SHARDS: number;
export const DEFAULT_WAKE_WITHIN_MS: number;
export const LAYOUT_TTL_MS: number;
export const LAYOUT_RECHECK_MS: number;
