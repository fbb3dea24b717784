"""DC-DPSGD: clipping the body and the tail of the gradient distribution separately."""
