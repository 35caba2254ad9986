"""radixgen.runtime: engine, scheduler, model runner, sampling, server, CLI, benchmarks."""
