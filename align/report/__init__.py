"""What a person reads: the plan and outcomes on the console, `align status`, and `align report`'s pages
and plots, all from what a run leaves on disk. Imports anything below it, run/ included.
"""
