"""radixgen.constrained: regex, JSON-schema and choice constraints as token automata."""
