"""The workspace's code: `src.fets` names the plan's templates."""
