"""The real one-node Slurm harness lives in faultline/testing/slurm.py (the remediation
drill uses it too); the system tests import it from here."""

from __future__ import annotations

from faultline.testing.slurm import Slurm, slurm_available, slurm_cluster, start_slurm

__all__ = ["Slurm", "slurm_available", "slurm_cluster", "start_slurm"]
