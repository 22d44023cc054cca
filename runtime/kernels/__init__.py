"""specx's own kernels (native/kernels): the custom-op library a graph on GGUF blocks needs."""
