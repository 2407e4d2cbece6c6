"""The fleet twin: the real service in closed loop with a simulated cluster (`railover twin`).

cluster: the simulated nodes, leaves, jobs and fault trace; loop: the service driven
through its public API on a manual clock, and the books (GPU-hours lost by cause, the
invariants); cli: the policies side by side. inprocess and hardware run the service in
this process and describe the nodes it registers (the demo and the tests use them too).
"""
