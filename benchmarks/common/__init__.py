"""What the benchmarks share: `procs` (the processes a run starts and measures),
`clients` (librdkafka and the Java tools as load), `cluster` (topics and replicas on the
3-rack cluster), `report` (figures and Markdown), `run` (the run's command, code, signals
and polling)."""
