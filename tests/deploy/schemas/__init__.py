"""KubeRay CRD schemas (see README.md here)."""
