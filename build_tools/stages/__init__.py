"""The release pipeline stages, in order: vendor → native → wheels → validate → smoke → publish."""
