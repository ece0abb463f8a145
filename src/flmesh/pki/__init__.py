"""flmesh.pki."""
