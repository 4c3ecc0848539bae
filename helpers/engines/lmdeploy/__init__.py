"""LMDeploy: its rule per release, read from the release's own files (``source``) and applied (``rule``);
recorded where the files cannot be read. It does not run here."""
