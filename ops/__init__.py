"""vlfleet controller side: the operator CLI (Fabric tasks), model build, staging fleets, rollout."""
