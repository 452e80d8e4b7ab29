"""Memory banks built over a conversation: the memory policies that decide each fact's operation
(`policies`), the resumable build (`build`), and the recipe that names and opens them (`recipe`)."""
