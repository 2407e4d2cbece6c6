"""Use cases: each gathers inputs from the store, runs the engine, stores the outcome."""
