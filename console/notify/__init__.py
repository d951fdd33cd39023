"""Outbound notifications: one module per channel, plus one small HTTP transport.

Channel modules only build payloads from a `message.Notification`; `transport.send`
is the only code that touches the network. Nothing here reads settings or the database.
"""
