"""flmesh.reports."""
