"""The commands of ``python -m helpers``: each module is named after its command and is the only
place a parsed ``Namespace`` is seen (``__main__`` holds the table)."""
