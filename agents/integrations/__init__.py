"""Integrations with the launchers and frameworks workloads already use (DESIGN.md §7).

`agents.integrations.torchelastic` (the torchrun launcher's agent), `agents.integrations.torchft`
(TorchFT's Manager), `agents.integrations.transformers.FaultlineCallback` (a Hugging Face
`TrainerCallback`) and `agents.integrations.lightning.FaultlineCallback` (a Lightning
`Callback`, both sharing `agents.integrations.common.Session`). Each imports its framework
lazily: importing `agents.integrations.<name>` costs nothing on a node without that
framework, and the `agents` package keeps importing with the standard library alone.
docs/integrations.md says, per integration, how it is installed, the one line, what it
reports and what not.
"""
