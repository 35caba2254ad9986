"""radixgen.kernels: Triton kernels, each beside a plain-torch reference. Imports only torch and triton."""
