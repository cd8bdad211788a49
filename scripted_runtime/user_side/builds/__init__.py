"""SGLang builds a scenario can run against: cached pip environments, source
trees over an existing environment, and git revisions in throwaway worktrees
(``spec`` parses, ``envs`` builds environments, ``worktrees`` checks out
revisions, ``side`` runs scenarios in a build and reports the outcome)."""
