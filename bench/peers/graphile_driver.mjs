// The graphile-worker driver: runs on Node.js with graphile-worker from bench/.node-peers (which
// bench/run.py fills from npm), one operation per invocation, printing one `RESULT {json}` line like
// the Python drivers (bench/harness.py describes the operations, their options and their figures).
//
// Uses graphile-worker's public API as its docs show it: `runMigrations` for the schema,
// `makeWorkerUtils` with `addJob` for one job and `addJobs` (one `add_jobs` SQL call) for many,
// `runOnce` (the library form of the CLI's `--once`: run until no runnable job is left, then exit)
// for the drain and `run` for the idle-latency worker. The worker has the configuration of
// graphile-worker's own perfTest (perfTest/graphile.config.js): 24 concurrent jobs, a pool of 25,
// a local queue of 500 jobs (refetch delay 10 ms), batched completion and failure (delay 0); the
// per-job success log is off, as in the perfTest.

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const NOOP = "bench.noop"; // bench/harness.py NOOP
const RESULT_PREFIX = "RESULT ";
const IDLE_SECONDS = 1.0;
const WARM_UP = 20;

process.env.NO_LOG_SUCCESS = "1"; // read by graphile-worker when it is imported, as its perfTest sets it

const peers = createRequire(new URL("../.node-peers/package.json", import.meta.url));
const load = async (name) => import(pathToFileURL(peers.resolve(name)).href);
const { makeWorkerUtils, run, runMigrations, runOnce } = await load("graphile-worker");

/** The command line of bench/harness.py parse_args: an operation, then `--option value` pairs. */
const OPTIONS = {
  "--dsn": "dsn",
  "--jobs": "jobs",
  "--concurrency": "concurrency",
  "--batch": "batch",
  "--interval": "interval",
  "--limit": "limit",
  "--start-at": "startAt",
};

function parseArgs(argv) {
  const args = { op: argv[0], dsn: "", jobs: 1000, concurrency: 10, batch: 0, interval: 0.02, limit: "", startAt: 0 };
  for (let i = 1; i < argv.length; i += 2) {
    const name = OPTIONS[argv[i]];
    if (name === undefined) throw new Error(`unknown option ${argv[i]}`);
    args[name] = typeof args[name] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  return args;
}

/** Wall-clock seconds (like Python's time.time()), so that stamps of two processes compare. */
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, Math.max(0, seconds) * 1000));

/** The worker options of graphile-worker's perfTest; `--concurrency` jobs, a local queue of `--batch`. */
function preset(args) {
  return {
    worker: {
      connectionString: args.dsn,
      concurrentJobs: args.concurrency,
      maxPoolSize: args.concurrency + 1,
      localQueue: args.batch > 0 ? { size: args.batch, refetchDelay: { durationMs: 10 } } : { size: -1 },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
      gracefulShutdownAbortTimeout: 2500,
    },
  };
}

/** `count` no-op job specs. No `--limit`: bench/suite.py LIMITS_SUPPORTED says why graphile-worker has none. */
function specs(args, count) {
  if (args.limit) throw new Error(`graphile-worker is not run with --limit ${args.limit}`);
  return Array.from({ length: count }, () => ({ identifier: NOOP, payload: {} }));
}

async function withUtils(args, body) {
  const utils = await makeWorkerUtils({ connectionString: args.dsn });
  try {
    return await body(utils);
  } finally {
    await utils.release();
  }
}

const enqueueResult = (jobs, started, ended) => ({ rate: jobs / (ended - started), seconds: ended - started, started, ended });

const operations = {
  async setup(args) {
    await runMigrations({ connectionString: args.dsn });
    return { installed: true };
  },

  async enqueue_single(args) {
    return withUtils(args, async (utils) => {
      for (let i = 0; i < WARM_UP; i++) await utils.addJob(NOOP, {});
      await sleep(args.startAt ? args.startAt - now() : 0);
      const started = now();
      for (let i = 0; i < args.jobs; i++) await utils.addJob(NOOP, {});
      return enqueueResult(args.jobs, started, now());
    });
  },

  /** `--concurrency` producers share one WorkerUtils (its pool of 10), one `addJob` per job. */
  async enqueue_concurrent(args) {
    return withUtils(args, async (utils) => {
      let left = args.jobs;
      const producer = async () => {
        while (left > 0) {
          left -= 1;
          await utils.addJob(NOOP, {});
        }
      };
      await Promise.all(Array.from({ length: args.concurrency }, () => utils.addJob(NOOP, {})));
      await sleep(args.startAt ? args.startAt - now() : 0);
      const started = now();
      await Promise.all(Array.from({ length: args.concurrency }, producer));
      return enqueueResult(args.jobs, started, now());
    });
  },

  async enqueue_bulk(args) {
    return withUtils(args, async (utils) => {
      await utils.addJobs(specs(args, WARM_UP));
      const started = performance.now();
      const jobs = await utils.addJobs(specs(args, args.jobs));
      const seconds = (performance.now() - started) / 1000;
      if (jobs.length !== args.jobs) throw new Error(`addJobs returned ${jobs.length} jobs for ${args.jobs}`);
      return { rate: args.jobs / seconds, seconds };
    });
  },

  /** All `--jobs` in one `addJobs` call: one `add_jobs` statement, as the perfTest fills its queue. */
  async fill(args) {
    await withUtils(args, (utils) => utils.addJobs(specs(args, args.jobs)));
    return { jobs: args.jobs };
  },

  /** `runOnce` from start to exit; the handler stamps when each job starts (bench/harness.py drain_result). */
  async drain(args) {
    let count = 0;
    let first = Infinity;
    let last = -Infinity;
    const noop = () => {
      const at = now();
      count += 1;
      first = Math.min(first, at);
      last = Math.max(last, at);
    };
    const started = now();
    await runOnce({ preset: preset(args), taskList: { [NOOP]: noop }, noHandleSignals: true });
    const ended = now();
    return {
      count,
      first: count ? first : NaN,
      last: count ? last : NaN,
      steady: count > 1 && last > first ? (count - 1) / (last - first) : NaN,
      wall: count / (ended - started),
      started,
      ended,
    };
  },

  /** An idle worker; jobs added one `addJob` at a time, `--interval` apart; addJob call → handler start. */
  async latency(args) {
    const startedAt = new Map();
    let allStarted;
    const done = new Promise((resolve) => { allStarted = resolve; });
    const noop = (_payload, helpers) => {
      startedAt.set(String(helpers.job.id), performance.now());
      if (startedAt.size >= args.jobs) allStarted();
    };
    const runner = await run({ preset: preset(args), taskList: { [NOOP]: noop }, noHandleSignals: true });
    const sent = new Map();
    try {
      await withUtils(args, async (utils) => {
        await sleep(IDLE_SECONDS);
        const start = performance.now();
        for (let i = 0; i < args.jobs; i++) {
          await sleep((start + i * args.interval * 1000 - performance.now()) / 1000);
          const before = performance.now();
          const job = await utils.addJob(NOOP, {});
          sent.set(String(job.id), before);
        }
        await Promise.race([done, sleep(60)]);
      });
    } finally {
      await runner.stop();
    }
    const ms = [...sent].filter(([id]) => startedAt.has(id)).map(([id, at]) => startedAt.get(id) - at);
    return { count: ms.length, expected: args.jobs, ...percentiles(ms), max: ms.length ? Math.max(...ms) : NaN };
  },
};

/** Nearest-rank percentiles, as bench/harness.py percentile. */
function percentiles(values) {
  const ordered = [...values].sort((a, b) => a - b);
  const at = (fraction) => (ordered.length ? ordered[Math.max(1, Math.ceil(fraction * ordered.length)) - 1] : NaN);
  return { p50: at(0.5), p95: at(0.95), p99: at(0.99) };
}

/** One `RESULT {json}` line; NaN written as Python's json module writes it (JSON.stringify would write null). */
function emit(values) {
  const text = JSON.stringify(values, (_key, value) => (Number.isNaN(value) ? "\u0000NaN" : value));
  console.log(RESULT_PREFIX + text.replaceAll('"\\u0000NaN"', "NaN"));
}

const args = parseArgs(process.argv.slice(2));
const operation = operations[args.op];
if (operation === undefined) throw new Error(`graphile_driver: no operation ${args.op}`);
emit(await operation(args));
process.exit(0); // a drain is timed to its end; nothing left open may hold the process after it
