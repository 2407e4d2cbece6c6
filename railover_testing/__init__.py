"""What the tests, the demo and the benchmarks share; never shipped in the service or agent.

- ``sysfs_node``: sysfs trees laid out as Linux lays them out (``sysfs_kernel_values``:
  what their files hold; ``sysfs_faults``: changing them under a running agent);
- ``agents``: agents run in-process, and a stand-in for the service's agent endpoints;
- ``fake_agent``: a stand-in for the agent's plugin socket;
- ``simjob``: a simulated training job whose ranks use the real native plugin;
- ``local``: the real service served on loopback inside this process, and
  ``cluster_shapes``: node registrations of common GPU servers, with no sysfs tree
  (both now names for scheduler_svc.twin.inprocess and .hardware, which the fleet twin
  ships with the product);
- ``demo``: the script `make demo` plays.

It lives at the top of a source checkout and is left out of the wheel
(``[tool.setuptools.packages.find]`` in pyproject.toml).
"""
