-- The leader's cleaner runs without JIT compilation. `delete_finished_jobs` is a SQL function, planned
-- without its arguments' values, so the planner estimates a batch's walk over every finished row: with
-- 1M finished rows 823,106, above `jit_above_cost` (100,000) and the inlining and optimizing thresholds
-- of PostgreSQL's defaults, and since migration 17's check for unfinished parents raised that
-- estimate, each batch of 1,000 was compiled by LLVM before it ran: 153 ms per batch where the walk
-- itself takes 2 ms (6,302 rows/s against 58,272 for migration 11's cleaner). A batch is a short walk
-- of an index: compiling it never pays.
ALTER FUNCTION {schema}.delete_finished_jobs(text, double precision, integer) SET jit = off;
