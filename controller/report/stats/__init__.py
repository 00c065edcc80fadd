"""Statistics over prompts: intervals, shares, paired comparisons, speed. Pure: they render nothing."""
