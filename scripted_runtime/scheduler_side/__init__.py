"""Code that runs inside SGLang's scheduler process (driver rank), between
two iterations of the frozen event loop: it must not block on anything the
scheduler itself has to make progress for, and it never imports
``scripted_runtime.user_side``."""
