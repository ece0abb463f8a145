"""flmesh.deploy: one federation file deployed beyond one machine (``fl-deploy``).

Compose files (:mod:`~flmesh.deploy.compose`), Kubernetes manifests (:mod:`~flmesh.deploy.k8s`),
systemd units (:mod:`~flmesh.deploy.systemd`) and what goes beside them: the derived federation
file and the certificates (:mod:`~flmesh.deploy.files`).

May import: :mod:`flmesh.config`, :mod:`flmesh.pki`; pyyaml; never training code.
"""
