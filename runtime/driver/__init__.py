"""The driver side of a run: the cluster (``cluster``), `trainforge train` (``launch``) and
`trainforge submit` (``submit``). Workers never import from here."""
