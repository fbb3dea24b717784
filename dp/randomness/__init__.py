"""Every draw that protects privacy: the secure stream, the Gaussian mechanism, exact samplers, Poisson sampling."""
