"""The operator's side: the HTTP admin API (pure HTTP, views, server), its CLI client and fleet
status.
"""
