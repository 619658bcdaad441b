"""What the command line runs besides the ops: the self-check, machine facts, NVRTC and PTX reports."""
