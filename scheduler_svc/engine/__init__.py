"""Pure decision logic: no database, clock or network inside; time is an argument."""
