"""Decoding loops of the strategies that transformers 5 no longer runs in its core.

A strategy names its loop as "module:function" (`Strategy.loop`); the engine imports it.
"""
