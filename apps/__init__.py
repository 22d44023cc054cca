"""specx apps: the command line, the benchmark and (coming) the servers, on top of the runtime,
the profiles and the exporter. Nothing below imports this package."""
