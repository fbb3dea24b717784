"""The model zoo's torch modules and the parameter shapes both sides check."""
