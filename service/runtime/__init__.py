"""What runs the service on its host, whatever the layer: settings from VLFLEET_* (and the contract the fleet side
reads from them), the model artifact's manifest, memory guard, page-cache release of mapped weights, metrics and
JSON logs. Imports nothing of the other layers.
"""
