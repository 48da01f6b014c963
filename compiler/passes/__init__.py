"""The compiler passes, one plain function per module, chained by `compiler.compile`."""
