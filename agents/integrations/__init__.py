"""Framework integrations: a training framework's own hook points, reported to Faultline.

`agents.integrations.transformers.FaultlineCallback` (a Hugging Face `TrainerCallback`) and
`agents.integrations.lightning.FaultlineCallback` (a Lightning `Callback`) share
`agents.integrations.common.Session`. Each module imports its framework when it is itself
imported; nothing under `agents` imports them, so the agent runs on the standard library
alone (docs/integrations.md).
"""
