"""Tables and figures of the studies, written deterministically."""
