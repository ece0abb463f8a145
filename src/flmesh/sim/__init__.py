"""flmesh.sim: a whole federation in one process (fl-sim's engine).

:class:`~flmesh.sim.simulation.Simulation` (set-up, results, pictures) with a peer driver
(:mod:`~flmesh.sim.peer`, the peer round's row included) and a star driver
(:mod:`~flmesh.sim.star`) on threads (:mod:`~flmesh.sim.threads`), every process built on one
transport backend (:mod:`~flmesh.sim.processes`); run folders' records, resumes and sweeps
(:mod:`~flmesh.reports.record`, :mod:`~flmesh.sim.resume`, :mod:`~flmesh.sim.sweep`); the
simulated clock (:mod:`~flmesh.sim.simulated_time`) and the planners that take a round's
time-dependent decisions on it (:mod:`~flmesh.sim.arrivals`, :mod:`~flmesh.sim.buffer_plan`,
:mod:`~flmesh.sim.walk_plan`).

May import: everything below it (:mod:`flmesh.runtime`, :mod:`flmesh.aggregator`,
:mod:`flmesh.reports`, the transport backends through the registry); never a command line.
"""
