"""`faultline demo`: the service plus a simulated fleet of real agents that fails live.

runner (the `faultline demo` process and its children), scenario (layout, fault matrix,
schedules), simulator (the workload child's loop), training and serving (the simulated
groups), fleet (reaching the nodes' agents and fake GPUs).
"""
