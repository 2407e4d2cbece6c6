"""Planning tools: Monte Carlo simulation, the analytic model and FlowCheck mirror planning."""
