"""The pipeline's logic: what each Lambda and the worker do, free of Lambda events and
`os.environ`. AWS is reached only through the small adapters in `stores`, which take clients."""
