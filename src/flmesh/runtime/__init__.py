"""flmesh.runtime."""
