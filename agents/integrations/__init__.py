"""Integrations with the launchers and frameworks workloads already use (DESIGN.md §7).

Each module imports its framework lazily, inside the functions that need it: importing
`agents.integrations.<name>` costs nothing on a node without that framework, and the
`agents` package keeps importing with the standard library alone. docs/integrations.md
says, per integration, how it is installed, the one line, what it reports and what not.
"""
