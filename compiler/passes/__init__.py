"""The compiler passes, one plain function per module, chained by `compiler.pipeline.compile_plan`."""
