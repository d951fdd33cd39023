"""The console's one read of ingest's telemetry tables, one module per record family.

Every read in `console` of a table `ingest` owns lives in this package, so it is the only
part of the console that imports `ingest` (an import-linter contract holds it). Callers
import the family they read (`from console.queries.telemetry import step_rows`):

- `rank_tables`: the per-rank tables a live diagnosis follows by id (steps, collectives,
  process groups, processes)
- `step_rows`: the group page's step charts, and the step rows of recovery costs
- `lifecycle`: transitions and the exits that ended generations
- `checkpoint_rows`: checkpoint lists, a step's saves, the history checkpoint advice reads
- `serving_windows`: serving windows
- `traces`: the one step or request an incident is about
- `group_evidence`: a snapshot's event-sized group evidence (checkpoints, transitions, serving,
  probes, contract violations)
- `node_evidence`: device events, host/network/kernel evidence, exposure
- `agent_state`: ingest's bookkeeping of its agents
- `shared`: the time windows and record shapes the others share

Reads are bounded by time and walk the telemetry indexes; chart reads aggregate in
Postgres. Nothing here writes.
"""
