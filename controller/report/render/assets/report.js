// report.html's behaviour, after the charts' data: sortable tables (a click on a header,
// or #sort=COLUMN / #sort=-COLUMN in the address), then plotly draws every chart.
// Inlined by controller/report/html.py.
function sortTable(table, col, desc){
 var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
 rows.sort(function(a,b){
  var x=a.cells[col].getAttribute('data-v'), y=b.cells[col].getAttribute('data-v');
  if(x===''&&y==='')return 0; if(x==='')return 1; if(y==='')return -1;
  var nx=parseFloat(x), ny=parseFloat(y), c;
  c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:x.localeCompare(y);
  return desc?-c:c;});
 rows.forEach(function(r){body.appendChild(r);});
 Array.prototype.forEach.call(headRow(table).cells,function(th,i){
  th.className=(th.className.replace(/ ?(asc|desc)/g,''))+(i===col?(desc?' desc':' asc'):'');});
}
function headRow(table){return table.tHead.rows[table.tHead.rows.length-1];}
document.querySelectorAll('table.sortable').forEach(function(table){
 Array.prototype.forEach.call(headRow(table).cells,function(th,i){
  th.addEventListener('click',function(){sortTable(table,i,th.className.indexOf(' asc')>=0);});});
});
(function(){var m=/sort=(-?)([\w.]+)/.exec(location.hash);if(!m)return;
 var table=document.getElementById('summary-table');
 Array.prototype.forEach.call(headRow(table).cells,function(th,i){
  if(th.getAttribute('data-col')===m[2])sortTable(table,i,m[1]==='-');});})();
// sticky cell columns: each one's left offset is the width of those before it; the column
// headers sit under the group row
(function(){var table=document.getElementById('summary-table');if(!table)return;
 var left=0,head=headRow(table);
 Array.prototype.forEach.call(head.cells,function(th,i){if(th.className.indexOf('k')<0)return;
  table.querySelectorAll('tr>:nth-child('+(i+1)+').k').forEach(function(c){c.style.setProperty('--left',left+'px');});
  left+=th.getBoundingClientRect().width;});
 var g=table.tHead.rows[0];if(g!==head)table.style.setProperty('--head-top',g.getBoundingClientRect().height+'px');
 var first=g.cells[0];if(first&&first.className.indexOf('g-cell')>=0){first.classList.add('k');}})();
// "print without examples": the body's class decides what report.css prints
(function(){var box=document.getElementById('print-no-samples');if(!box)return;
 function apply(){document.body.classList.toggle('print-no-samples',box.checked);}
 box.addEventListener('change',apply);apply();})();
(window.__reportCharts||[]).forEach(function(c){
 c.fig.layout.template=window.__reportTemplate;
 Plotly.newPlot(c.id,c.fig.data,c.fig.layout,{responsive:true,displaylogo:false,
  displayModeBar:c.id==='chart-quality-speed'?'hover':false});});
// In print, each chart at the printed page's width: plotly draws at a fixed pixel size (no viewBox that
// would scale), so a chart laid out for the screen printed at a fraction of the page. The widths are
// report.css's A4 landscape page less its margins (277 mm at 96 px/in), the metric grid two to a row.
(function(){var PAGE=1040;
 function each(fn){document.querySelectorAll('.js-plotly-plot').forEach(fn);}
 function toPrint(){each(function(div){var w=div.closest('.grid')?Math.floor(PAGE/2)-8:PAGE;
  div.dataset.printWidth=w;Plotly.relayout(div,{width:w,autosize:false});});}
 function toScreen(){each(function(div){if(!div.dataset.printWidth)return;delete div.dataset.printWidth;
  Plotly.relayout(div,{width:null,autosize:true}).then(function(){Plotly.Plots.resize(div);});});}
 window.addEventListener('beforeprint',toPrint);window.addEventListener('afterprint',toScreen);
 var mq=window.matchMedia&&window.matchMedia('print');
 if(mq&&mq.addEventListener)mq.addEventListener('change',function(m){if(m.matches)toPrint();else toScreen();});})();
