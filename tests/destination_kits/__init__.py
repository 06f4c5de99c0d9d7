"""One kit per destination kind for the shared contract suite (tests/test_destination_contract.py)."""
