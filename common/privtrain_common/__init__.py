"""What the privtrain client and service share: the model zoo, the model file format, directed rounding."""
