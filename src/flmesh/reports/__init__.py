"""flmesh.reports: what a run leaves behind, and the tools that read it.

The one results schema (:mod:`~flmesh.reports.results`: round rows and summaries, built from a
node's round reports), the run files written atomically (:mod:`~flmesh.reports.run_files`),
the pictures (:mod:`~flmesh.reports.pictures`, :mod:`~flmesh.reports.privacy_picture`), and
the run tools behind ``fl-sim report`` and ``fl-sim compare``: reading a run folder
(:mod:`~flmesh.reports.run_tools`), merging fl-node folders (:mod:`~flmesh.reports.merge`),
comparing runs (:mod:`~flmesh.reports.compare`, :mod:`~flmesh.reports.compare_runs`).

May import: :mod:`flmesh.runtime`'s reports, :mod:`flmesh.learning`, :mod:`flmesh.format`,
:mod:`flmesh.replay`'s ledger; matplotlib; never a transport, the aggregator or fl-sim.
"""
